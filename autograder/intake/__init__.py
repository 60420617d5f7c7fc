"""What reads the submissions, outside the sandbox: untrusted files parsed as data, never run.

* :mod:`.ingest`: which file is whose (nbgrader's layout, zips, LMS downloads), one entry per student
  and assignment;
* :mod:`.plan`: a notebook read strictly, matched to the release's cells, turned into the steps the
  sandbox runs;
* :mod:`.slicing`: which statements of the cells a student added run (the graded slice), in bounded time;
* :mod:`.scan`: what a static reading decides: built-ins graded code names (costs), and what goes to a
  person (review, by value).
"""
