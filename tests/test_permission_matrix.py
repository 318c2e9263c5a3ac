import pytest
from django.urls import reverse

from tests.support.matrix import API_LIST_MATRIX, ROLES, api_list_url_names

pytestmark = pytest.mark.django_db


def test_every_api_list_endpoint_is_declared():
    assert api_list_url_names() == set(API_LIST_MATRIX), "declare new endpoints in tests/support/matrix.py"


@pytest.mark.parametrize("name", sorted(API_LIST_MATRIX))
@pytest.mark.parametrize("role", ROLES)
def test_list_endpoint_answers_each_role_as_declared(api, users, name, role):
    if role != "anonymous":
        api.as_token(users[role], "read")
    response = api.get(reverse(f"api:{name}"))
    assert response.status_code == API_LIST_MATRIX[name][role], response.content
    assert response["Content-Type"].startswith("application/json")
