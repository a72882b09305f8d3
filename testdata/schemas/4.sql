-- 2ef6b6d's migration to schema version 4, as deployed.
PRAGMA application_id = 1346720851;
