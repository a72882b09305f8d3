-- An Idempotency-Key belongs to the API key that sent it, through a
-- digest derived from the key's. Older rows have no scope and match no
-- request: which client sent them is not known.
ALTER TABLE pets ADD COLUMN idempotency_scope BLOB;
DROP INDEX pets_idempotency_key;
CREATE UNIQUE INDEX pets_idempotency_key ON pets (idempotency_scope, idempotency_key)
	WHERE idempotency_key IS NOT NULL AND idempotency_scope IS NOT NULL;
