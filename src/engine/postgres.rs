//! PostgreSQL engine (being written).
