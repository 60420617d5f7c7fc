"""The referee: the trusted side of a submission's grading, in the grader's process.

* :mod:`.protocol`: the conversation with the sandbox over two pipes, bounded, in order;
* :mod:`.calls`: the tests' probes asked from here, the student's code answering in the sandbox;
  the hidden checks' code, cases and judges never leave this process; the per-submission draw;
* :mod:`.judge`: the verdict on each test, from the answers;
* :mod:`.clock`: the benchmark, timed from here.
"""
