-- 2ef6b6d's migration to schema version 2, as deployed.
ALTER TABLE pets ADD COLUMN idempotency_key TEXT;
	ALTER TABLE pets ADD COLUMN request_fingerprint BLOB;
	CREATE UNIQUE INDEX pets_idempotency_key ON pets (idempotency_key)
		WHERE idempotency_key IS NOT NULL;
