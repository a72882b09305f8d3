-- 2ef6b6d's migration to schema version 8, as deployed.
ALTER TABLE pets_changes ADD COLUMN deleted INTEGER NOT NULL DEFAULT 0;
	UPDATE pets_changes SET deleted = inserted - (SELECT count(*) FROM pets);
	DROP TRIGGER pets_deleted;
	CREATE TRIGGER pets_deleted AFTER DELETE ON pets
		BEGIN UPDATE pets_changes SET changed = changed + 1, deleted = deleted + 1; END;
	DROP TRIGGER pets_replacing;
	CREATE TRIGGER pets_replacing BEFORE INSERT ON pets
		WHEN EXISTS (SELECT 1 FROM pets WHERE id = NEW.id)
			OR (NEW.idempotency_key IS NOT NULL AND NEW.idempotency_scope IS NOT NULL
				AND EXISTS (SELECT 1 FROM pets WHERE idempotency_scope = NEW.idempotency_scope
					AND idempotency_key = NEW.idempotency_key))
		BEGIN UPDATE pets_changes SET changed = changed + 1, deleted = deleted + 1; END;
