"""The hidden checks of every exercise (instructor side).

Each module registers its checks into the student runtime's registry
(:data:`coursekit.checks.REGISTRY`) when imported; :func:`coursekit.checks.load_all` imports them
whenever this package is importable. The student pack (``make student-pack``) never contains it.
"""
