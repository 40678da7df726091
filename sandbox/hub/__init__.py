"""The Hugging Face Hub stand-in: repos of generated tiny models, served with the Hub's wire behaviour."""
