-- A covering status index (0007 drops it).
CREATE INDEX pets_status_cover ON pets (status, id, name, category_id);
DROP INDEX pets_status_id;
