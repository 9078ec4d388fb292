-- gap-healer, SQL Server: the identity of GlobalPosition.
-- seed is the lowest position the column can produce (the floor below which
-- nothing is a hole); current_value is IDENT_CURRENT, which a fill must never
-- move (an explicit value above it would become the new current value).
SELECT
    CAST(IDENT_SEED(N'__schema__.[Messages]') AS BIGINT) AS seed,
    CAST(IDENT_INCR(N'__schema__.[Messages]') AS BIGINT) AS increment,
    CAST(IDENT_CURRENT(N'__schema__.[Messages]') AS BIGINT) AS current_value;
