//! A stuck lease with a huge TTL: requests on its key wait without a database session; fresh keys still get 201; out-of-range Redis db and TTL refused at start.
