import pytest

pytestmark = pytest.mark.django_db

ROLES = ["provider-admin", "operator", "tenant-admin", "tenant-viewer"]


@pytest.mark.parametrize("role", ROLES)
def test_each_role_logs_in_and_sees_its_home(client, users, tenant_a, role):
    user = users[role]
    response = client.post("/accounts/login/", {"username": user.username, "password": "correct-horse-9"})
    assert response.status_code == 302 and response["Location"] == "/"
    page = client.get("/").content.decode()
    if role in ("provider-admin", "operator"):
        assert "Fleet overview" in page and 'data-topic="fleet"' in page
        assert 'href="/audit/"' in page
    else:
        assert f"<h1>{tenant_a.name}" in page and f'data-topic="tenant-{tenant_a.pk}"' in page
        assert 'href="/audit/"' not in page
    assert role in page


def test_wrong_password_is_refused(client, users):
    response = client.post("/accounts/login/", {"username": users["operator"].username, "password": "nope"})
    assert response.status_code == 200 and "did not match" in response.content.decode()


def test_logout_is_a_post(client, users):
    client.force_login(users["operator"])
    assert client.post("/accounts/logout/").status_code == 302
    assert client.get("/").status_code == 302


def test_pages_need_login(client, db):
    for path in ["/", "/tokens/", "/audit/"]:
        response = client.get(path)
        assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")


@pytest.mark.parametrize(
    "role, status",
    [("provider-admin", 200), ("operator", 200), ("tenant-admin", 403), ("tenant-viewer", 403)],
)
def test_audit_page_is_for_provider_roles(client, users, role, status):
    client.force_login(users[role])
    assert client.get("/audit/").status_code == status


def test_pages_load_no_third_party_assets(client, users):
    client.force_login(users["provider-admin"])
    for path in ["/", "/tokens/", "/audit/"]:
        html = client.get(path).content.decode()
        assert "http://" not in html.replace("http://www.w3.org", "") and "https://" not in html
