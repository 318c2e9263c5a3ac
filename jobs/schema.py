from drf_spectacular.extensions import OpenApiAuthenticationExtension


class JobTokenScheme(OpenApiAuthenticationExtension):
    target_class = "jobs.authentication.JobTokenAuthentication"
    name = "jobToken"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "A job's own token (progress/ only), shown at submission",
        }
