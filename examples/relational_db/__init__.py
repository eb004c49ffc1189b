"""Relational Mutagenesis from a SQL database (SQLite or PostgreSQL); see docs/relational_db.md."""
