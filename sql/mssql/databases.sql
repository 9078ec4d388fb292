-- The databases of a [[store_sets]] entry: names LIKE @P1 that are online
-- (state 0), the system databases aside.
SELECT name
FROM sys.databases
WHERE name LIKE @P1
    AND state = 0
    AND database_id > 4
ORDER BY name;
