-- The databases of a [[store_sets]] entry: names LIKE $1 that accept
-- connections, templates aside.
SELECT datname::text AS name
FROM pg_database
WHERE datname LIKE $1::text
  AND datallowconn
  AND NOT datistemplate
ORDER BY datname;
