#!/usr/bin/env bash

sed -i 's/^\[service\]$/[Service]/; s|^ExecStart=bin/webhook|ExecStart=/opt/webhook/bin/webhook|' /app/etc/systemd/system/webhook.service
