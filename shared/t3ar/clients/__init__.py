"""HTTP clients of the services (retriever, adaptation API) on one base (:mod:`t3ar.clients.http`), raising
the core errors."""
