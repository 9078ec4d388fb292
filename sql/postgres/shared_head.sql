-- One store's head in the reading the stores of one database share
-- (shared_heads.sql holds one of these per store): the highest committed
-- position, from one end of the primary key index; NULL for an empty table.
-- An expression, not a statement.
(SELECT MAX(__position__) FROM __table__)
