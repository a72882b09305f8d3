-- Reads came from memory, so the status index went.
DROP INDEX IF EXISTS pets_status_cover;
