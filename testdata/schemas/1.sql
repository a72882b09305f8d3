-- 2ef6b6d's migration to schema version 1, as deployed.
CREATE TABLE pets (
		id          INTEGER PRIMARY KEY AUTOINCREMENT,
		name        TEXT    NOT NULL CHECK (length(name) BETWEEN 1 AND 100),
		category_id INTEGER NOT NULL CHECK (category_id >= 1),
		status      TEXT    NOT NULL CHECK (status IN ('available', 'pending', 'sold'))
	) STRICT;
	CREATE INDEX pets_status_id ON pets (status, id);
