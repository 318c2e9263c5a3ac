"""The one exception services raise for a refused change; the API turns it into a 4xx."""


class ServiceError(Exception):
    """A change a service refuses: ``field`` names the input at fault, ``status`` is the HTTP code to answer."""

    def __init__(self, detail: str, *, field: str | None = None, status: int = 400):
        super().__init__(detail)
        self.detail = detail
        self.field = field
        self.status = status

    def as_response_data(self) -> dict:
        return {self.field: [self.detail]} if self.field else {"detail": self.detail}
