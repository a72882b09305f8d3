-- 2ef6b6d's migration to schema version 7, as deployed.
DROP INDEX IF EXISTS pets_status_cover;
