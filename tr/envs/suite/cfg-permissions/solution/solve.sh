#!/usr/bin/env bash

ls -lR /app/site

chmod 755 /app/site /app/site/bin /app/site/public /app/site/bin/* && chmod 700 /app/site/conf && chmod 600 /app/site/conf/* && chmod 644 /app/site/public/* && ls -lR /app/site
