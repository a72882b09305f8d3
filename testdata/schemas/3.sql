-- 2ef6b6d's migration to schema version 3, as deployed.
CREATE INDEX pets_status_cover ON pets (status, id, name, category_id);
	DROP INDEX pets_status_id;
