#!/usr/bin/env bash

cd /app/repo && git rm -q --cached secrets.env && git commit -q -m "Remove secrets"
