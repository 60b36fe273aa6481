//! [4] Which credential a request carries, among the methods its route accepts: an API key
//! (`X-Api-Key`, or `Authorization: Bearer` when the value is not a JWT), a bearer token
//! (`Authorization: Bearer`, or a configured header or cookie) or the connection's client
//! certificate. Exactly one, or a refusal: with two, which one counts would be the client's
//! choice, and the upstream might read the other.

use crate::chain::auth::{bearer_token, extract_key, ApiKeyError, Auth, API_KEY};
use crate::chain::jwt::verify::looks_like_jwt;
use http::header::{AUTHORIZATION, COOKIE};
use http::{HeaderMap, HeaderName, HeaderValue};

/// Where a route reads bearer tokens.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum TokenFrom {
    /// `Authorization: Bearer <token>`.
    #[default]
    Authorization,
    /// The whole value of this header.
    Header(HeaderName),
    /// The value of this cookie.
    Cookie(String),
}

impl TokenFrom {
    /// `authorization`, `header:NAME`, `cookie:NAME`.
    pub fn parse(text: &str) -> Result<TokenFrom, String> {
        match text.split_once(':') {
            None if text == "authorization" => Ok(TokenFrom::Authorization),
            Some(("header", name)) => match HeaderName::from_bytes(name.as_bytes()) {
                Ok(h) if h == AUTHORIZATION => Ok(TokenFrom::Authorization),
                Ok(h) if h == COOKIE || h == API_KEY => {
                    Err(format!("{name:?} cannot carry the token"))
                }
                Ok(h) => Ok(TokenFrom::Header(h)),
                Err(_) => Err(format!("{name:?} is not a header name")),
            },
            Some(("cookie", name))
                if !name.is_empty()
                    && name.len() <= 64
                    && name
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.')) =>
            {
                Ok(TokenFrom::Cookie(name.to_owned()))
            }
            _ => Err(format!(
                "{text:?}: expected \"authorization\", \"header:NAME\" or \"cookie:NAME\""
            )),
        }
    }

    pub fn describe(&self) -> String {
        match self {
            TokenFrom::Authorization => "authorization".into(),
            TokenFrom::Header(h) => format!("header:{h}"),
            TokenFrom::Cookie(c) => format!("cookie:{c}"),
        }
    }
}

/// The one credential of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Credential<'a> {
    ApiKey(&'a [u8]),
    Token(&'a str),
    Certificate,
}

/// Why no single credential could be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CredentialError {
    /// None of the route's methods found one: 401.
    Missing(Auth),
    /// Two credentials, or one given twice: 400.
    Ambiguous(&'static str),
    /// An API key that cannot be one (repeated, malformed): as for API-key routes.
    Key(ApiKeyError),
    /// The client certificate carries no name the gateway identifies by: 401.
    UnnamedCertificate,
}

impl CredentialError {
    pub fn detail(&self) -> String {
        match self {
            CredentialError::Missing(auth) => {
                let mut wanted = Vec::new();
                if auth.api_key {
                    wanted.push("an API key (X-Api-Key or Authorization: Bearer)");
                }
                if auth.jwt {
                    wanted.push("a bearer token");
                }
                if auth.client_cert {
                    wanted.push("a client certificate");
                }
                format!("this route needs {}", wanted.join(" or "))
            }
            CredentialError::Ambiguous(why) => (*why).to_owned(),
            CredentialError::Key(e) => e.detail().to_owned(),
            CredentialError::UnnamedCertificate => {
                "the client certificate carries no name to identify it by".to_owned()
            }
        }
    }
}

/// The request's credential for a route with `auth` reading tokens `from`; `has_cert`: the
/// connection presented a verified client certificate.
pub fn credential<'a>(
    auth: Auth,
    from: &TokenFrom,
    headers: &'a HeaderMap,
    has_cert: bool,
) -> Result<Credential<'a>, CredentialError> {
    let mut authorization = headers.get_all(AUTHORIZATION).iter();
    let raw_authorization = authorization.next().map(HeaderValue::as_bytes);
    let bearer = raw_authorization
        .and_then(bearer_token)
        .filter(|t| !t.is_empty());
    if authorization.next().is_some() {
        return Err(CredentialError::Key(ApiKeyError::RepeatedAuthorization));
    }
    let mut bearer_is_key = auth.api_key;
    let token: Option<&str> = if auth.jwt {
        match from {
            TokenFrom::Authorization => match bearer {
                Some(b) if !auth.api_key || looks_like_jwt(b) => {
                    bearer_is_key = false;
                    // A token is base64url and dots: anything else is malformed (a 401).
                    Some(std::str::from_utf8(b).unwrap_or(""))
                }
                _ => None,
            },
            TokenFrom::Header(name) => single(headers.get_all(name).iter())?,
            TokenFrom::Cookie(name) => cookie(headers, name)?,
        }
    } else {
        None
    };
    if token.is_some() && *from != TokenFrom::Authorization && bearer.is_some() && !auth.api_key {
        return Err(CredentialError::Ambiguous(
            "the request carries a bearer token in Authorization and where this route reads it",
        ));
    }
    let key = if auth.api_key {
        let api_keys = headers.get_all(API_KEY).iter().map(HeaderValue::as_bytes);
        let authorization = raw_authorization.filter(|_| bearer_is_key);
        match extract_key(api_keys, authorization.into_iter()) {
            Ok(key) => Some(key),
            Err(ApiKeyError::Missing) => None,
            Err(e) => return Err(CredentialError::Key(e)),
        }
    } else {
        None
    };
    let cert = auth.client_cert && has_cert;
    match (key, token, cert) {
        (Some(key), None, false) => Ok(Credential::ApiKey(key)),
        (None, Some(token), false) => Ok(Credential::Token(token)),
        (None, None, true) => Ok(Credential::Certificate),
        (None, None, false) => Err(CredentialError::Missing(auth)),
        _ => Err(CredentialError::Ambiguous(
            "the request carries more than one credential",
        )),
    }
}

/// The one non-empty value of a header, if any.
fn single<'a>(
    mut values: impl Iterator<Item = &'a HeaderValue>,
) -> Result<Option<&'a str>, CredentialError> {
    let first = values.next();
    if values.next().is_some() {
        return Err(CredentialError::Ambiguous(
            "the token's header is given more than once",
        ));
    }
    Ok(first
        .map(|v| std::str::from_utf8(v.as_bytes()).unwrap_or("").trim())
        .filter(|v| !v.is_empty()))
}

/// The value of cookie `name` across every `Cookie` header (HTTP/2 splits them), if any.
///
/// Refused (400) when the cookies cannot be read one way: a `Cookie` field that is not text
/// (skipping it would let a second token through to the upstream), the name twice, or the
/// name under another spelling an upstream may take for it — ASP.NET Core matches cookie
/// names ignoring case, PHP percent-decodes them and reads `.` and ` ` as `_`.
fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Result<Option<&'a str>, CredentialError> {
    let mut found = None;
    for value in headers.get_all(COOKIE) {
        let Ok(text) = std::str::from_utf8(value.as_bytes()) else {
            return Err(CredentialError::Ambiguous(
                "a Cookie header is not text: its cookies cannot be read one way",
            ));
        };
        for pair in text.split(';') {
            let Some((n, v)) = pair.split_once('=') else {
                continue;
            };
            let n = n.trim();
            if n != name {
                if cookie_names_alike(n, name) {
                    return Err(CredentialError::Ambiguous(
                        "the token's cookie is given under another spelling of its name",
                    ));
                }
                continue;
            }
            if found.is_some() {
                return Err(CredentialError::Ambiguous(
                    "the token's cookie is given more than once",
                ));
            }
            let v = v.trim();
            let v = v
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .unwrap_or(v);
            found = Some(v).filter(|v| !v.is_empty());
        }
    }
    Ok(found)
}

/// Whether an upstream could read cookie name `seen` as `name` (configured names are ASCII
/// letters, digits, `_`, `-` and `.`): compared after percent-decoding, ignoring ASCII case,
/// with `.`, ` ` and `_` alike.
fn cookie_names_alike(seen: &str, name: &str) -> bool {
    fn canonical(b: u8) -> u8 {
        match b {
            b'.' | b' ' => b'_',
            b => b.to_ascii_lowercase(),
        }
    }
    let seen = seen.as_bytes();
    // Cheap refusal of the common case: a name that cannot decode to `name`'s length.
    if seen.len() < name.len() || seen.len() > name.len() * 3 {
        return false;
    }
    let mut decoded = Vec::with_capacity(name.len());
    let mut i = 0;
    while i < seen.len() {
        let b = match (seen[i], seen.get(i + 1..i + 3)) {
            (b'%', Some(hex)) => match std::str::from_utf8(hex)
                .ok()
                .and_then(|h| u8::from_str_radix(h, 16).ok())
            {
                Some(b) => {
                    i += 2;
                    b
                }
                None => b'%',
            },
            (b, _) => b,
        };
        decoded.push(canonical(b));
        i += 1;
    }
    decoded.len() == name.len()
        && decoded
            .iter()
            .zip(name.bytes())
            .all(|(a, b)| *a == canonical(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    const JWT: &str = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ1In0.c2ln";

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    fn both() -> Auth {
        Auth {
            api_key: true,
            jwt: true,
            client_cert: false,
        }
    }

    fn jwt_only() -> Auth {
        Auth {
            jwt: true,
            ..Auth::NONE
        }
    }

    #[test]
    fn a_bearer_value_is_a_token_when_it_looks_like_one_and_a_key_otherwise() {
        let from = TokenFrom::Authorization;
        let h = headers(&[("authorization", &format!("Bearer {JWT}"))]);
        assert_eq!(
            credential(both(), &from, &h, false),
            Ok(Credential::Token(JWT))
        );
        let h = headers(&[("authorization", "Bearer alice-key-0001")]);
        assert_eq!(
            credential(both(), &from, &h, false),
            Ok(Credential::ApiKey(b"alice-key-0001"))
        );
        // A JWT-only route takes whatever the bearer is as a token (then refused as malformed).
        assert_eq!(
            credential(jwt_only(), &from, &h, false),
            Ok(Credential::Token("alice-key-0001"))
        );
        assert_eq!(
            credential(Auth::API_KEY, &from, &h, false),
            Ok(Credential::ApiKey(b"alice-key-0001"))
        );
    }

    #[test]
    fn two_credentials_or_none_are_refused() {
        let from = TokenFrom::Authorization;
        let h = headers(&[
            ("authorization", &format!("Bearer {JWT}")),
            ("x-api-key", "alice-key-0001"),
        ]);
        assert!(matches!(
            credential(both(), &from, &h, false),
            Err(CredentialError::Ambiguous(_))
        ));
        let h = headers(&[("authorization", &format!("Bearer {JWT}"))]);
        let cert_or_jwt = Auth {
            client_cert: true,
            ..jwt_only()
        };
        assert!(matches!(
            credential(cert_or_jwt, &from, &h, true),
            Err(CredentialError::Ambiguous(_))
        ));
        assert_eq!(
            credential(cert_or_jwt, &from, &HeaderMap::new(), true),
            Ok(Credential::Certificate)
        );
        assert_eq!(
            credential(both(), &from, &HeaderMap::new(), false),
            Err(CredentialError::Missing(both()))
        );
        let h = headers(&[("authorization", "Bearer a"), ("authorization", "Bearer b")]);
        assert_eq!(
            credential(jwt_only(), &from, &h, false),
            Err(CredentialError::Key(ApiKeyError::RepeatedAuthorization))
        );
    }

    #[test]
    fn tokens_come_from_a_named_header_or_cookie_once() {
        let from = TokenFrom::parse("cookie:session").unwrap();
        let h = headers(&[("cookie", &format!("a=1; session={JWT}"))]);
        assert_eq!(
            credential(jwt_only(), &from, &h, false),
            Ok(Credential::Token(JWT))
        );
        let h = headers(&[("cookie", "session=x"), ("cookie", "b=2; session=y")]);
        assert!(matches!(
            credential(jwt_only(), &from, &h, false),
            Err(CredentialError::Ambiguous(_))
        ));
        let h = headers(&[
            ("cookie", &format!("session={JWT}")),
            ("authorization", "Bearer other"),
        ]);
        assert!(matches!(
            credential(jwt_only(), &from, &h, false),
            Err(CredentialError::Ambiguous(_))
        ));
        // Another spelling an upstream reads as the same cookie, alone or next to it.
        for other in ["Session", "SESSION", "sess%69on", "Sess%69on", "%73ession"] {
            let h = headers(&[("cookie", &format!("session={JWT}; {other}=y"))]);
            assert!(
                matches!(
                    credential(jwt_only(), &from, &h, false),
                    Err(CredentialError::Ambiguous(_))
                ),
                "{other}"
            );
        }
        let h = headers(&[("cookie", "a=1; sessions=2; sessio=3; xsession=4")]);
        assert_eq!(
            credential(jwt_only(), &from, &h, false),
            Err(CredentialError::Missing(jwt_only()))
        );
        // A Cookie field that is not text cannot be read one way.
        let mut h = headers(&[("cookie", &format!("session={JWT}"))]);
        h.append(
            COOKIE,
            HeaderValue::from_bytes(b"y=\xff; session=forged").unwrap(),
        );
        assert!(matches!(
            credential(jwt_only(), &from, &h, false),
            Err(CredentialError::Ambiguous(_))
        ));
        let dotted = TokenFrom::parse("cookie:my.session").unwrap();
        let h = headers(&[("cookie", &format!("my.session={JWT}; my_session=y"))]);
        assert!(matches!(
            credential(jwt_only(), &dotted, &h, false),
            Err(CredentialError::Ambiguous(_))
        ));
        let from = TokenFrom::parse("header:X-Token").unwrap();
        let h = headers(&[("x-token", JWT)]);
        assert_eq!(
            credential(jwt_only(), &from, &h, false),
            Ok(Credential::Token(JWT))
        );
        let h = headers(&[("x-token", JWT), ("x-token", JWT)]);
        assert!(credential(jwt_only(), &from, &h, false).is_err());
        assert!(TokenFrom::parse("header:cookie").is_err());
        assert!(TokenFrom::parse("query:t").is_err());
        assert_eq!(
            TokenFrom::parse("header:Authorization"),
            Ok(TokenFrom::Authorization)
        );
    }
}
