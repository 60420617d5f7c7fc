"""What writes the outputs: the rows (:mod:`.outcome`), grades.csv and results.json (:mod:`.results`),
the feedback pages and the class report (:mod:`.feedback`, ``templates/``)."""
