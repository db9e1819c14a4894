"""Hints: the text given to the model with each page (text layer or Tesseract OCR)."""
