"""Plumbing shared by the services: the job contract of the API and the workers, errors and their HTTP
mapping, bearer auth, metrics, body limits, request ids, the app factory."""
