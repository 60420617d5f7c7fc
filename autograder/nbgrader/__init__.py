"""nbgrader's side: grading into a course directory (:mod:`.course_dir`: its gradebook, ``autograded/``,
the formgrader's flags), the gradebook of a class graded elsewhere (:mod:`.gradebook`), and the course's
exchange classes (:mod:`.collect`, :mod:`.release_feedback`) that ``nbgrader_config.py`` names."""
