//! What the runtime reads from a SPIR-V module besides handing it to the driver: the
//! capabilities it declares (what the device must offer), a specialization constant's default
//! value (a kernel's declared handoff role, `kernels/glsl/handoff.glsl`) and which
//! storage-buffer bindings of set 0 it may write (what replay's handoff plan checks for
//! hazards).

use std::collections::BTreeMap;

const OP_CAPABILITY: u32 = 17;
const OP_TYPE_STRUCT: u32 = 30;
const OP_TYPE_POINTER: u32 = 32;
const OP_SPEC_CONSTANT: u32 = 50;
const OP_VARIABLE: u32 = 59;
const OP_DECORATE: u32 = 71;
const OP_MEMBER_DECORATE: u32 = 72;
const DECORATION_SPEC_ID: u32 = 1;
const DECORATION_NON_WRITABLE: u32 = 24;
const DECORATION_BINDING: u32 = 33;
const DECORATION_DESCRIPTOR_SET: u32 = 34;

/// The instructions of `words` after the 5-word header, as (opcode, operand words); a
/// truncated or zero-length instruction ends the walk.
fn instructions(words: &[u32]) -> impl Iterator<Item = (u32, &[u32])> + '_ {
    let mut at = 5;
    std::iter::from_fn(move || {
        let &first = words.get(at)?;
        // Word count in the high half, opcode in the low.
        let (len, op) = ((first >> 16) as usize, first & 0xffff);
        let operands = words.get(at + 1..at + len)?;
        at += len;
        Some((op, operands))
    })
}

/// Whether an `OpCapability` of the module names `capability`.
pub fn declares_capability(words: &[u32], capability: u32) -> bool {
    instructions(words).any(|(op, o)| op == OP_CAPABILITY && o.first() == Some(&capability))
}

/// The default value of the 32-bit specialization constant with SpecId `id`, if the module
/// declares one.
pub fn spec_constant_default(words: &[u32], id: u32) -> Option<u32> {
    let target = instructions(words).find_map(|(op, o)| {
        (op == OP_DECORATE && o.get(1..3) == Some(&[DECORATION_SPEC_ID, id])).then(|| o[0])
    })?;
    instructions(words).find_map(|(op, o)| {
        (op == OP_SPEC_CONSTANT && o.len() == 3 && o[1] == target).then(|| o[2])
    })
}

/// The bindings of descriptor set 0 that some variable of the module may write, as a bit mask
/// (bit b: binding b; bindings past 63 are not reported). A variable is read-only when it or
/// every member of its block is decorated NonWritable (GLSL's `readonly`).
pub fn written_bindings(words: &[u32]) -> u64 {
    let mut set = BTreeMap::new();
    let mut binding = BTreeMap::new();
    let mut non_writable_var = std::collections::BTreeSet::new();
    // Struct id -> (members decorated NonWritable).
    let mut ro_members: BTreeMap<u32, usize> = BTreeMap::new();
    let mut struct_members: BTreeMap<u32, usize> = BTreeMap::new();
    let mut pointee = BTreeMap::new();
    let mut vars = Vec::new();
    for (op, o) in instructions(words) {
        match op {
            OP_DECORATE if o.len() >= 2 => match o[1] {
                DECORATION_DESCRIPTOR_SET if o.len() >= 3 => {
                    set.insert(o[0], o[2]);
                }
                DECORATION_BINDING if o.len() >= 3 => {
                    binding.insert(o[0], o[2]);
                }
                DECORATION_NON_WRITABLE => {
                    non_writable_var.insert(o[0]);
                }
                _ => {}
            },
            OP_MEMBER_DECORATE if o.len() >= 3 && o[2] == DECORATION_NON_WRITABLE => {
                *ro_members.entry(o[0]).or_default() += 1;
            }
            OP_TYPE_STRUCT if !o.is_empty() => {
                struct_members.insert(o[0], o.len() - 1);
            }
            OP_TYPE_POINTER if o.len() == 3 => {
                pointee.insert(o[0], o[2]);
            }
            OP_VARIABLE if o.len() >= 3 => vars.push((o[0], o[1])),
            _ => {}
        }
    }
    let mut mask = 0u64;
    for (ty, var) in vars {
        let (Some(&0), Some(&b)) = (set.get(&var), binding.get(&var)) else {
            continue;
        };
        let block = pointee.get(&ty).copied().unwrap_or(0);
        let read_only = non_writable_var.contains(&var)
            || struct_members
                .get(&block)
                .is_some_and(|&n| n > 0 && ro_members.get(&block).copied().unwrap_or(0) >= n);
        if !read_only && b < 64 {
            mask |= 1 << b;
        }
    }
    mask
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A module of the given instructions after a header.
    fn module(instrs: &[&[u32]]) -> Vec<u32> {
        let mut w = vec![0x0723_0203, 0x0001_0000, 0, 100, 0];
        for i in instrs {
            w.push(((i.len() as u32) << 16) | i[0]);
            w.extend_from_slice(&i[1..]);
        }
        w
    }

    #[test]
    fn reads_a_spec_constant_default() {
        let m = module(&[
            &[OP_DECORATE, 7, DECORATION_SPEC_ID, 190],
            &[OP_DECORATE, 8, DECORATION_SPEC_ID, 0],
            &[OP_SPEC_CONSTANT, 2, 8, 128],
            &[OP_SPEC_CONSTANT, 2, 7, 0x8000_000e],
        ]);
        assert_eq!(spec_constant_default(&m, 190), Some(0x8000_000e));
        assert_eq!(spec_constant_default(&m, 0), Some(128));
        assert_eq!(spec_constant_default(&m, 5), None);
        // Truncated: the walk stops, nothing is found past the cut.
        assert_eq!(spec_constant_default(&m[..m.len() - 2], 190), None);
    }

    #[test]
    fn tells_written_bindings_from_read_only_ones() {
        // Block 10 (one member, NonWritable) at binding 1; block 11 (two members, one
        // NonWritable) at binding 0; a NonWritable variable of block 11 at binding 2; block 11
        // again at binding 3 of set 1 (not set 0).
        let m = module(&[
            &[OP_DECORATE, 20, DECORATION_DESCRIPTOR_SET, 0],
            &[OP_DECORATE, 20, DECORATION_BINDING, 1],
            &[OP_DECORATE, 21, DECORATION_DESCRIPTOR_SET, 0],
            &[OP_DECORATE, 21, DECORATION_BINDING, 0],
            &[OP_DECORATE, 22, DECORATION_DESCRIPTOR_SET, 0],
            &[OP_DECORATE, 22, DECORATION_BINDING, 2],
            &[OP_DECORATE, 22, DECORATION_NON_WRITABLE],
            &[OP_DECORATE, 23, DECORATION_DESCRIPTOR_SET, 1],
            &[OP_DECORATE, 23, DECORATION_BINDING, 3],
            &[OP_MEMBER_DECORATE, 10, 0, DECORATION_NON_WRITABLE],
            &[OP_MEMBER_DECORATE, 11, 1, DECORATION_NON_WRITABLE],
            &[OP_TYPE_STRUCT, 10, 5],
            &[OP_TYPE_STRUCT, 11, 5, 5],
            &[OP_TYPE_POINTER, 30, 12, 10],
            &[OP_TYPE_POINTER, 31, 12, 11],
            &[OP_VARIABLE, 30, 20, 12],
            &[OP_VARIABLE, 31, 21, 12],
            &[OP_VARIABLE, 31, 22, 12],
            &[OP_VARIABLE, 31, 23, 12],
        ]);
        assert_eq!(written_bindings(&m), 0b001);
    }
}
