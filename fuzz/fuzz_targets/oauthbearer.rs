//! SASL/OAUTHBEARER's server side (`network::oauthbearer`): the client's initial response
//! in RFC 7628's framing, then its bearer token through both of Kafka's validators (the
//! unsecured one, and the JWKS one over a fixed RSA key).
//!
//! Input: the initial response's bytes. Checks: no panic; a token the JWKS validator
//! takes names a principal; no unsigned token passes the JWKS validator.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use rill_broker::network::oauthbearer::{ClientInitialResponse, JwksValidator, UnsecuredValidator};

/// A JWKS of one public RSA key (the modulus of a throwaway 2048-bit key).
const JWKS: &str = r#"{"keys":[{"kty":"RSA","kid":"k1","use":"sig","alg":"RS256","e":"AQAB",
"n":"sXchDaQebHnPiGvyDOAT4saGEUetSyo9MKLOoWFsueri23bOdgWp4Dy1WlUzewbgBHod5pcM9H95GQRV3JDXboIRROSBigeC5yjU1hGzHHyXss8UDprecbAYxknTcQkhslANGRUZmdTOQ5qTRsLAt6BTYuyvVRdhS8exSZEy_c4gs_7svlJJQ4H9_NxsiIoLwAEk7-Q3UXERGYw_75IDrGA84-lA_-Ct4eTlXHBIY2EaV7t7LjJaynVJCpkv4LKjTTAumiGUIuQhrNhZLuF_RJLqHpM2kgWFLU7-VDdL1VbC2tejvcI2BlMkEpk1BzBZI0KQB0GaDWFLN-aEAw3vRw"}]}"#;

fn jwks() -> &'static JwksValidator {
    static V: OnceLock<JwksValidator> = OnceLock::new();
    V.get_or_init(|| {
        let set = serde_json::from_str(JWKS).expect("the fixed JWKS parses");
        JwksValidator::new(set, Default::default(), None, 30, "sub".into(), "scope".into())
            .expect("the fixed JWKS has a usable key")
    })
}

fn unsecured() -> &'static UnsecuredValidator {
    static V: OnceLock<UnsecuredValidator> = OnceLock::new();
    V.get_or_init(|| UnsecuredValidator::from_jaas("").expect("no options"))
}

fuzz_target!(|data: &[u8]| {
    let Ok(initial) = ClientInitialResponse::parse(data) else {
        return;
    };
    let now_ms = 1_800_000_000_000;
    let _ = unsecured().validate(&initial.token, now_ms);
    if let Ok(token) = jwks().validate(&initial.token, now_ms) {
        assert!(!token.principal_name.is_empty());
        assert!(!initial.token.ends_with('.'), "an unsigned token passed the JWKS validator");
    }
});
