"""The real offline data kit: the emoji style-shift sets and the clipart pool, built from npm / Debian packages."""
