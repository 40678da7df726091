"""Which PREFECT_API_URL a cloud-run-v2 pool's jobs can use (tasks/checks/api_reach.py): a loopback or unset URL is
refused by bootstrap and doctor, a private address gets Direct VPC egress, anything else is used as it is."""

from __future__ import annotations

import pytest

from tasks.checks.api_reach import api_reach

LOOPBACK = [
    "http://127.0.0.1:4200/api",
    "http://127.8.9.10:4200/api",
    "http://localhost:4200/api",
    "http://LocalHost/api",
    "http://prefect.localhost:4200/api",  # RFC 6761: every *.localhost name is loopback
    "http://0.0.0.0:4200/api",
    "http://[::1]:4200/api",
    "http://[::]:4200/api",
    "http://[::ffff:127.0.0.1]:4200/api",
]
PRIVATE = ["http://10.1.2.3:4200/api", "http://172.16.0.9/api", "http://172.31.255.1/api", "https://192.168.1.20/api",
           "http://100.64.0.5:4200/api"]  # fmt: skip
PUBLIC = [
    "https://api.prefect.cloud/api/accounts/a/workspaces/w",
    "https://prefect.example.com/api",
    "http://34.120.1.2:4200/api",
    "http://172.32.0.1/api",  # just past 172.16.0.0/12
    "http://prefect.internal:4200/api",  # a name is not resolved here: what it means in a job is not known here
]


@pytest.mark.parametrize("url", LOOPBACK)
def test_a_loopback_url_is_this_machine_which_a_job_never_reaches(url):
    assert api_reach(url) == "loopback"


@pytest.mark.parametrize("url", PRIVATE)
def test_a_private_address_is_reached_through_the_vpc(url):
    assert api_reach(url) == "private"


@pytest.mark.parametrize("url", PUBLIC)
def test_cloud_a_public_address_or_a_name_is_used_as_it_is(url):
    assert api_reach(url) == "public"


@pytest.mark.parametrize("url", [None, "", "not a url"])
def test_no_url_is_unset(url):
    assert api_reach(url) == "unset"
