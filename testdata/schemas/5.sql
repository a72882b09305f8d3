-- 2ef6b6d's migration to schema version 5, as deployed.
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
