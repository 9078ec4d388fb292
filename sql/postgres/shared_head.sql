-- One store's head in the reading the stores of one database share
-- (src/engine/postgres/heads.rs joins one of these per store into
-- SELECT ARRAY[...]): the highest committed position, from one end of the
-- primary key index; NULL for an empty table. An expression, not a statement.
(SELECT MAX(__position__) FROM __table__)
