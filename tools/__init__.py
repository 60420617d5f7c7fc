"""Maintainer tools: the sample class (``python -m tools.sample_class``), fixture classes for the tests,
submissions made from fixtures, and the comparison with stock nbgrader (``make bench-grade``).
Not part of the grader that instructors install."""
