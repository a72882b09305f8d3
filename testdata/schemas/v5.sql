-- A petstore database as deployed at schema version 5 (2ef6b6d's
-- migrations 1 to 5), holding three pets.
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
PRAGMA application_id = 1346720851;
CREATE TABLE pets_changes (
		id       INTEGER PRIMARY KEY CHECK (id = 1),
		inserted INTEGER NOT NULL,
		changed  INTEGER NOT NULL
	) STRICT;
	INSERT INTO pets_changes VALUES (1, (SELECT count(*) FROM pets), 0);
	CREATE TRIGGER pets_inserted AFTER INSERT ON pets
		BEGIN UPDATE pets_changes SET inserted = inserted + 1; END;
	CREATE TRIGGER pets_updated AFTER UPDATE ON pets
		BEGIN UPDATE pets_changes SET changed = changed + 1; END;
	CREATE TRIGGER pets_deleted AFTER DELETE ON pets
		BEGIN UPDATE pets_changes SET changed = changed + 1; END;
	-- INSERT OR REPLACE deletes the row it replaces without firing delete
	-- triggers (recursive_triggers is off by default): count it here.
	CREATE TRIGGER pets_replacing BEFORE INSERT ON pets
		WHEN EXISTS (SELECT 1 FROM pets WHERE id = NEW.id)
			OR (NEW.idempotency_key IS NOT NULL
				AND EXISTS (SELECT 1 FROM pets WHERE idempotency_key = NEW.idempotency_key))
		BEGIN UPDATE pets_changes SET changed = changed + 1; END;
INSERT INTO pets (name, category_id, status) VALUES ('Rex', 1, 'available'), ('Tom', 2, 'pending'), ('Max', 3, 'sold');
PRAGMA user_version = 5;
