#!/usr/bin/env bash

cd /app/report && mv email.py email_utils.py && mv string.py string_utils.py && sed -i 's/^from email import format_address$/from email_utils import format_address/; s/^from string import title$/from string_utils import title/' main.py
