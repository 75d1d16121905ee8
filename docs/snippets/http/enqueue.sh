# The API at $API (for example http://127.0.0.1:8000), started with
# `pgfleet api --app tasks:registry`: payloads are checked against the handler.
curl -si "$API/jobs" -H 'Content-Type: application/json' \
     -d '{"name": "send_email", "payload": {"to": "ada@example.com", "subject": "Welcome"},
          "options": {"delay": 5, "job_key": "welcome:ada"}}'

# A batch: one transaction, every id in the answer.
curl -s "$API/jobs" -H 'Content-Type: application/json' \
     -d '{"jobs": [{"name": "send_email", "payload": {"to": "bob@example.com", "subject": "Hi"}},
                   {"name": "send_email", "payload": {"to": "eve@example.com", "subject": "Hi"}}]}'

# The newest jobs, then one job's status record.
curl -s "$API/jobs?name=send_email&limit=5"
