-- Idempotency-Key, in the pet's own row, so that it commits with it: a
-- retry after a crash finds exactly the pets that were acknowledged.
ALTER TABLE pets ADD COLUMN idempotency_key TEXT;
ALTER TABLE pets ADD COLUMN request_fingerprint BLOB;
CREATE UNIQUE INDEX pets_idempotency_key ON pets (idempotency_key) WHERE idempotency_key IS NOT NULL;
