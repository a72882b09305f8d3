-- 2ef6b6d's migration to schema version 6, as deployed.
ALTER TABLE pets ADD COLUMN idempotency_scope BLOB;
	DROP INDEX pets_idempotency_key;
	CREATE UNIQUE INDEX pets_idempotency_key ON pets (idempotency_scope, idempotency_key)
		WHERE idempotency_key IS NOT NULL AND idempotency_scope IS NOT NULL;
	DROP TRIGGER pets_replacing;
	CREATE TRIGGER pets_replacing BEFORE INSERT ON pets
		WHEN EXISTS (SELECT 1 FROM pets WHERE id = NEW.id)
			OR (NEW.idempotency_key IS NOT NULL AND NEW.idempotency_scope IS NOT NULL
				AND EXISTS (SELECT 1 FROM pets WHERE idempotency_scope = NEW.idempotency_scope
					AND idempotency_key = NEW.idempotency_key))
		BEGIN UPDATE pets_changes SET changed = changed + 1; END;
