-- The file is marked as petstore's ("PETS" in ASCII), so that another
-- application's file is refused rather than given a table.
PRAGMA application_id = 1346720851;
