"""The `t3ar` command line (:mod:`t3ar.cli.main`): the core commands; the services add theirs through the
``t3ar.commands`` entry-point group."""
