#!/usr/bin/env bash

chmod 755 /app/site/bin/*
