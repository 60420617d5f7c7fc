"""What builds the book: ``python -m book.build build`` (make book) and the experiments the chapters run
(``book.experiments``). Not installed for students, never visible inside the grading sandbox."""
