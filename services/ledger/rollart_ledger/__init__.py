"""The RollArt Job Ledger service."""
