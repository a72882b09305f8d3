-- Reads are SQL again: the status filter walks (status, id). The view's
-- change counts, their triggers and table, go from deployed files.
DROP TRIGGER IF EXISTS pets_inserted;
DROP TRIGGER IF EXISTS pets_updated;
DROP TRIGGER IF EXISTS pets_deleted;
DROP TRIGGER IF EXISTS pets_replacing;
DROP TABLE IF EXISTS pets_changes;
CREATE INDEX pets_status_id ON pets (status, id);
