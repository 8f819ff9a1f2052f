import json
from pathlib import Path

WANT = {
    "1": {"name": "Ada L.", "email": "ada@new.example", "plan": "pro", "mrr": 49},
    "2": {"name": "Brian", "email": "brian@billing.example", "plan": "pro", "mrr": 49},
    "3": {"name": "Chloe", "email": "chloe@example.com", "plan": "pro", "mrr": 49},
    "4": {"name": "Dmitri", "email": "dm@example.com", "plan": None, "mrr": 0},
    "5": {"name": None, "email": "ops@eve.example", "plan": "team", "mrr": 199},
}


def got():
    data = json.loads(Path("/app/customers.json").read_text())
    assert isinstance(data, dict) and data
    return data


def field(name):
    data = got()
    return {k: (v.get(name) if isinstance(v, dict) else None) for k, v in data.items()}


def test_all_customers_present():
    assert sorted(got()) == sorted(WANT)


def test_names_from_latest_crm_record():
    names = field("name")
    assert all(names.get(k) == v["name"] for k, v in WANT.items())


def test_plan_and_mrr_from_latest_billing_record():
    plan, mrr = field("plan"), field("mrr")
    assert all(plan.get(k) == v["plan"] and mrr.get(k) == v["mrr"] for k, v in WANT.items())


def test_email_from_newer_source():
    email = field("email")
    assert all(email.get(k) == v["email"] for k, v in WANT.items())


def test_skipped_count():
    assert Path("/app/skipped.txt").read_text().strip() == "2"


def test_final_gate():
    assert got() == WANT
    assert Path("/app/skipped.txt").read_text().strip() == "2"
