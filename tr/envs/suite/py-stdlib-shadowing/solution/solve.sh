#!/usr/bin/env bash

cd /tmp && python3 /app/report/main.py /app/report/sample.json; ls -la /app/report

cd /app/report && mv email.py email_utils.py && mv string.py string_utils.py && rm -f string.pyc && rm -rf __pycache__ && sed -i 's/^from email import format_address$/from email_utils import format_address/; s/^from string import title$/from string_utils import title/' main.py

cd /tmp && python3 /app/report/main.py /app/report/sample.json
