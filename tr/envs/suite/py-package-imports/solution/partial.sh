#!/usr/bin/env bash

printf 'from .normalize import clean\nfrom .stats import word_count\n\n__all__ = ["clean", "word_count"]\n' > /app/textkit/__init__.py
