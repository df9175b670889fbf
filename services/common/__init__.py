"""Plumbing shared by the services (API and retriever)."""
