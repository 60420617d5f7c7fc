"""Small modules the book's chapters import: one idea per module, the math beside the code."""
