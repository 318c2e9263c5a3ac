// A real OpenID Connect provider (the npm oidc-provider) for Lockstep's single sign-on tests.
// Started by tests/support/oidc.py as `node provider.mjs CONFIG.json`, where the config gives the port, the
// client (id, secret, redirect URI) and the accounts: login name -> {email, name, groups}. Its development
// login form takes any password; the login name picks the account, whose groups the userinfo answer carries.
import { readFileSync } from 'node:fs';
import Provider from 'oidc-provider';

const config = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const issuer = `http://127.0.0.1:${config.port}`;

const provider = new Provider(issuer, {
  clients: [{
    client_id: config.client_id,
    client_secret: config.client_secret,
    redirect_uris: [config.redirect_uri],
    grant_types: ['authorization_code'],
    response_types: ['code'],
  }],
  claims: {
    openid: ['sub'],
    email: ['email', 'email_verified'],
    profile: ['name', 'preferred_username'],
    groups: ['groups'],
  },
  scopes: ['openid', 'email', 'profile', 'groups'],
  features: { devInteractions: { enabled: true } },
  cookies: { keys: ['lockstep-test-oidc-provider-cookie-key'] },
  async findAccount(ctx, id) {
    const account = config.accounts[id] || { groups: [] };
    return {
      accountId: id,
      async claims() {
        return {
          sub: id,
          preferred_username: id,
          name: account.name || id,
          email: account.email || `${id}@example.test`,
          email_verified: true,
          groups: account.groups,
        };
      },
    };
  },
});

provider.listen(config.port, '127.0.0.1', () => {
  console.log(`oidc-provider listening on ${issuer}`);
});
