-- Whether a table exists: $1 is its qualified name.
SELECT TO_REGCLASS($1::text)::text AS found;
