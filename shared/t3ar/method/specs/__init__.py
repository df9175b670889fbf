"""The built-in methods' declarations, one module each: a :class:`~t3ar.method.registry.MethodSpec` registered
where its step class is named. Torch-free (the services and the CLI validate configs with them); the registry
imports every module here on its first lookup, so a new built-in method is one module here beside its step."""
