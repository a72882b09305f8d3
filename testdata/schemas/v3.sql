-- A petstore database as deployed at schema version 3 (2ef6b6d's
-- migrations 1 to 3), holding three pets.
CREATE TABLE pets (
		id          INTEGER PRIMARY KEY AUTOINCREMENT,
		name        TEXT    NOT NULL CHECK (length(name) BETWEEN 1 AND 100),
		category_id INTEGER NOT NULL CHECK (category_id >= 1),
		status      TEXT    NOT NULL CHECK (status IN ('available', 'pending', 'sold'))
	) STRICT;
	CREATE INDEX pets_status_id ON pets (status, id);
ALTER TABLE pets ADD COLUMN idempotency_key TEXT;
	ALTER TABLE pets ADD COLUMN request_fingerprint BLOB;
	CREATE UNIQUE INDEX pets_idempotency_key ON pets (idempotency_key)
		WHERE idempotency_key IS NOT NULL;
CREATE INDEX pets_status_cover ON pets (status, id, name, category_id);
	DROP INDEX pets_status_id;
INSERT INTO pets (name, category_id, status) VALUES ('Rex', 1, 'available'), ('Tom', 2, 'pending'), ('Max', 3, 'sold');
PRAGMA user_version = 3;
