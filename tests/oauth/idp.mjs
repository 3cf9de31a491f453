// Test authorization server for tests/it/gateway_oauth.rs: the certified
// `oidc-provider` (pinned in package.json) on 127.0.0.1, with resource
// indicators (RFC 8707), JWT access tokens for the gateway's resource, opaque
// tokens for a second resource (introspection), open dynamic client
// registration, client credentials, and a headless login/consent interaction
// (GET /interaction/:uid answers JSON; POST .../login and .../confirm finish it).
//
// Environment: IDP_PORT, IDP_STATE (a JSON file: keys persist across restarts,
// and the test reads the private keys from it to forge tokens), IDP_ROTATE=1
// (publish the spare key first: key rotation), IDP_JWT_RESOURCES and
// IDP_OPAQUE_RESOURCES (comma-separated resource URIs). Prints "ready <issuer>".
import crypto from 'node:crypto';
import fs from 'node:fs';
import querystring from 'node:querystring';

import Provider, { errors } from 'oidc-provider';

const port = Number(process.env.IDP_PORT);
const stateFile = process.env.IDP_STATE;
const issuer = `http://127.0.0.1:${port}`;
const jwtResources = (process.env.IDP_JWT_RESOURCES || '').split(',').filter(Boolean);
const opaqueResources = (process.env.IDP_OPAQUE_RESOURCES || '').split(',').filter(Boolean);
const accounts = { alice: 'tenant-a', bob: 'tenant-b' };
const clientTenants = { 'tester-a': 'tenant-a', 'tester-a2': 'tenant-a', 'tester-b': 'tenant-b' };

function newKey(kid) {
  const { privateKey } = crypto.generateKeyPairSync('rsa', { modulusLength: 2048 });
  return { ...privateKey.export({ format: 'jwk' }), kid, alg: 'RS256', use: 'sig' };
}

let state = fs.existsSync(stateFile) ? JSON.parse(fs.readFileSync(stateFile, 'utf8')) : null;
if (!state) {
  state = { current: newKey('key-1'), spare: newKey('key-2'), rotated: false };
}
if (process.env.IDP_ROTATE === '1') state.rotated = true;
const published = state.rotated ? [state.spare, state.current] : [state.current];
const der = (jwk) => crypto.createPrivateKey({ key: jwk, format: 'jwk' }).export({ type: 'pkcs1', format: 'der' }).toString('base64');
fs.writeFileSync(stateFile, JSON.stringify({
  ...state,
  issuer,
  // For the test's forged tokens: PKCS#1 DER (base64) of each private key.
  forge: { current: { kid: state.current.kid, der: der(state.current) }, spare: { kid: state.spare.kid, der: der(state.spare) } },
}));

const resourceInfo = (indicator) => {
  if (jwtResources.includes(indicator)) {
    return { scope: 'sandbox other', audience: indicator, accessTokenTTL: 600, accessTokenFormat: 'jwt', jwt: { sign: { alg: 'RS256' } } };
  }
  if (opaqueResources.includes(indicator)) {
    return { scope: 'sandbox other', audience: indicator, accessTokenTTL: 600, accessTokenFormat: 'opaque' };
  }
  throw new errors.InvalidTarget();
};

const clientCredentials = (id) => ({
  client_id: id, client_secret: `${id}-secret-0123456789`, grant_types: ['client_credentials'],
  response_types: [], redirect_uris: [], token_endpoint_auth_method: 'client_secret_basic',
});

const provider = new Provider(issuer, {
  clients: [clientCredentials('tester-a'), clientCredentials('tester-a2'), clientCredentials('tester-b'), clientCredentials('gateway-introspector')],
  jwks: { keys: published },
  scopes: ['openid', 'offline_access', 'sandbox', 'other'],
  findAccount: async (ctx, id) => (accounts[id] ? { accountId: id, claims: async () => ({ sub: id }) } : undefined),
  extraTokenClaims: async (ctx, token) => {
    const tenant = token.accountId ? accounts[token.accountId] : clientTenants[token.clientId];
    return tenant ? { tenant } : undefined;
  },
  interactions: { url: (ctx, interaction) => `/interaction/${interaction.uid}` },
  pkce: { required: () => true },
  features: {
    devInteractions: { enabled: false },
    registration: { enabled: true },
    clientCredentials: { enabled: true },
    introspection: { enabled: true, allowedPolicy: async (ctx, client) => client.clientId === 'gateway-introspector' },
    resourceIndicators: {
      enabled: true,
      defaultResource: async () => jwtResources[0],
      useGrantedResource: async () => true,
      getResourceServerInfo: async (ctx, indicator) => resourceInfo(indicator),
    },
  },
  ttl: { Interaction: 600, Session: 600, Grant: 600, AuthorizationCode: 120 },
});

async function readForm(req) {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  return querystring.parse(Buffer.concat(chunks).toString());
}

provider.use(async (ctx, next) => {
  const match = ctx.path.match(/^\/interaction\/([^/]+)(\/login|\/confirm)?$/);
  if (!match) return next();
  const { req, res } = ctx;
  const details = await provider.interactionDetails(req, res);
  if (ctx.method === 'GET' && !match[2]) {
    ctx.body = { uid: details.uid, prompt: details.prompt.name, client_id: details.params.client_id };
    return undefined;
  }
  if (ctx.method === 'POST' && match[2] === '/login') {
    const form = await readForm(req);
    if (!accounts[form.login]) {
      ctx.status = 400;
      ctx.body = { error: 'unknown account' };
      return undefined;
    }
    ctx.respond = false;
    return provider.interactionFinished(req, res, { login: { accountId: form.login } }, { mergeWithLastSubmission: false });
  }
  if (ctx.method === 'POST' && match[2] === '/confirm') {
    const { prompt: { details: missing }, params, session: { accountId } } = details;
    const grant = details.grantId ? await provider.Grant.find(details.grantId) : new provider.Grant({ accountId, clientId: params.client_id });
    if (missing.missingOIDCScope) grant.addOIDCScope(missing.missingOIDCScope.join(' '));
    if (missing.missingOIDCClaims) grant.addOIDCClaims(missing.missingOIDCClaims);
    for (const [indicator, scopes] of Object.entries(missing.missingResourceScopes || {})) {
      grant.addResourceScope(indicator, scopes.join(' '));
    }
    const grantId = await grant.save();
    ctx.respond = false;
    return provider.interactionFinished(req, res, { consent: { grantId } }, { mergeWithLastSubmission: true });
  }
  ctx.status = 405;
  return undefined;
});

provider.listen(port, '127.0.0.1', () => {
  console.log(`ready ${issuer}`);
});
